"""The adaptive loop: capture settings, refresh data, fine-tune, publish (docs/adaptive.md; CLI builders/refresh.py)."""
