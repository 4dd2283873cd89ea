"""Preference-data audit (``alignctl audit``): pure checks in :mod:`.checks`, reading and model
scoring in :mod:`.runner`, out-of-sample fold models in :mod:`.kfold`, output files and the console table in :mod:`.report`."""

from alignctl.audit.kfold import KFoldOptions
from alignctl.audit.auditing import AuditOptions, default_out, run_audit

__all__ = ["AuditOptions", "KFoldOptions", "default_out", "run_audit"]
