"""lowtide: exact progress tracking for streaming pipelines."""
