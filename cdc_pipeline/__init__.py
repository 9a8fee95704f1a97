"""CDC into Delta Lake: the pure-Python core (config table, intervals, paths); no Spark here."""

__version__ = "0.1.0"
