"""Errors that forge reports to users as a clear message rather than a traceback."""


class ForgeError(Exception):
    """A problem the user can fix: bad recipe, bad data, missing file. The CLI prints it plainly."""
