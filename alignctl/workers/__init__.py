"""alignctl.workers."""
