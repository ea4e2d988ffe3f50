"""Help output of every ``docoutbox`` command: defaults shown, descriptions kept whole."""

from __future__ import annotations

import argparse
import copy

from docoutbox_app.logs import mask


def _has_default(action: argparse.Action) -> bool:
    return (
        bool(action.option_strings)
        and action.default is not argparse.SUPPRESS
        and action.default is not None
        and action.default is not False
        and action.default != ""
    )


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (credentials in defaults masked; nothing for options
    without one) and keeps the description's line breaks."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and _has_default(action):
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not _has_default(action):
            return action.help
        return super()._get_help_string(action)

    def _expand_help(self, action: argparse.Action) -> str:
        return mask(super()._expand_help(action))
