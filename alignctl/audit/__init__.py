"""Preference-data audit (``alignctl audit``): pure checks in :mod:`.checks`, reading and model
scoring in :mod:`.runner`, output files and the console table in :mod:`.report`."""

from alignctl.audit.runner import AuditOptions, default_out, run_audit

__all__ = ["AuditOptions", "default_out", "run_audit"]
