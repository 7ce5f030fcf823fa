"""Shared test helpers: tiny configs and corpora, the CLI runner, msrun jobs. Import from the submodules."""
