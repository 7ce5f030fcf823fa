"""The one typed config model shared by every command (see sections.py, load.py, rules.py)."""
