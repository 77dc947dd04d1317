"""The ``pycoll`` command line: ``pycoll run | bench | doctor | model`` (see pycoll/cli/main.py)."""
