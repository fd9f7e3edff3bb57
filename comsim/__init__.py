"""ComSim: compositional simulation toolkit for robot learning data."""
__version__ = "0.1.0"
