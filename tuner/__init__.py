"""stagetune's domain core: schedules, search spaces, objectives, the tuning engine, storage.

Nothing in this package imports web or training-loop code.
"""

__version__ = "0.1.0"
