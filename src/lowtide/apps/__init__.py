"""Programs built on the product's public API: ``lowtide demo`` (exact windows against
a ``withWatermark`` query), ``lowtide spark demo`` (live progress) and ``lowtide
walkthrough`` (the tracker core alone)."""
