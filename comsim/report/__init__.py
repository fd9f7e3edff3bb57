from comsim.report.html import Report
from comsim.report.plots import bar_chart_svg, line_chart_svg, top_view_svg
from comsim.report.run import build_report

__all__ = ["Report", "bar_chart_svg", "build_report", "line_chart_svg", "top_view_svg"]
