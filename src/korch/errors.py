"""Errors a user sees as one line (the CLI prints ``korch: error: <message>``)."""


class KorchError(Exception):
    """A problem with the user's input or setup, reported without a traceback."""


class ModelError(KorchError):
    """A malformed, unsupported or under-specified ONNX model."""


class InputError(KorchError):
    """Inputs handed to a compiled model do not match its signature."""
