"""An example stagetune task package (see README.md)."""
