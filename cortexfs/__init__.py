"""CortexFS: a filesystem-shaped operating surface for AI agents and their humans."""

__version__ = "0.1.0"
