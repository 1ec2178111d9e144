
from specobs.tools.fleet._command import add_arguments, run

__all__ = ["add_arguments", "run"]
