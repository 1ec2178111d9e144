"""Terminal tools that read a live specobs endpoint: ``specobs top`` and ``specobs doctor``."""
