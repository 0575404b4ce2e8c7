"""procurd: a downstream procurement daemon for the signed site-to-site upstream API."""

__version__ = "0.1.0"
