"""Suite-wide settings. Tests assert behaviour, never speed: Hypothesis's per-example
deadline is off (a loaded CI machine made a 50 ms example take 260 ms)."""

from hypothesis import settings

settings.register_profile("lowtide", deadline=None)
settings.load_profile("lowtide")
