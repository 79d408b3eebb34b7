"""`flashsim replay`: being built (see the open issues); registers nothing yet."""

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    return None
