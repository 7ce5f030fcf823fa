"""The one CLI runner every command test invokes ``mftk`` through (stdout and stderr kept apart)."""
from __future__ import annotations

from typer.testing import CliRunner

runner = CliRunner()
