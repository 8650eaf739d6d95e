"""Errors that domain code raises for the MCP layer to turn into readable tool errors."""


class InputError(ValueError):
    """Bad input from a caller; the message says what was wrong and what is accepted."""


class NotFoundError(InputError):
    """A named thing (job, fit, file) does not exist; the message says how to find the valid names."""


class QuotaError(InputError):
    """A request would exceed a configured quota; the message names the quota and its setting."""
