"""edged: an inference runtime daemon for edge devices."""

__version__ = "0.1.0"
