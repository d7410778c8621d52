"""Argument types shared by the experiment scripts."""
import argparse


def at_least(lo):
    """An argparse type: a whole number of at least @lo (argparse then exits with status 2
    and the option's name when a value is not one)."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not a whole number" % text)
        if v < lo:
            raise argparse.ArgumentTypeError("%d is below %d" % (v, lo))
        return v
    return parse
