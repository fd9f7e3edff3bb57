from comsim.report.html import Report, bar_chart_svg
from comsim.report.run import build_report

__all__ = ["Report", "bar_chart_svg", "build_report"]
