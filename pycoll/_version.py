"""pycoll's version, in one place: ``pycoll.__version__``, ``pycoll --version`` and the package metadata
(``pyproject.toml`` reads it from here: ``[tool.setuptools.dynamic]``)."""

__version__ = "0.1.0"
