"""The adaptive refresh, above the build: refresh data from the capture store, fine-tune, gate, publish
(docs/adaptive.md; CLI adaptive/refresh.py). The capture settings the build writes: builders/capture_settings.py."""
