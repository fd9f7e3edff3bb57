from comsim.report.html import Report

__all__ = ["Report"]
