"""The REST API and the dashboard (FastAPI). Depends on :mod:`tuner`, never on training code."""
