"""The ``snlab serve`` subcommand (registered by :mod:`snlab.cli`)."""


def register(sub) -> None:
    """Add the serving subcommands to the ``snlab`` parser."""
