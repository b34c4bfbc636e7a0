"""The command line: `flowrl train|plan|algorithms|config|data|model|export|plot|trust` (`flowrl --help`).

Its arguments are flowrl.cli.args's, what each command does and how an error ends flowrl.cli.commands's, and
what `flowrl algorithms` and `flowrl config` list flowrl.cli.listing's.
"""

from flowrl.cli.commands import (EXIT_FAILURE, EXIT_FINISHED, EXIT_USER_ERROR, config_from_args, finished,
                                  format_warning, main, parse)
from flowrl.cli.listing import print_config

__all__ = ["EXIT_FAILURE", "EXIT_FINISHED", "EXIT_USER_ERROR", "config_from_args", "finished", "format_warning",
           "main", "parse", "print_config"]
