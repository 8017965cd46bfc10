"""The web console, served by the controller process (:mod:`confide.web.app`, :mod:`confide.web.accounts`)."""

from confide.web.accounts import Accounts, SignedIn
from confide.web.app import create_console_app

__all__ = ["Accounts", "SignedIn", "create_console_app"]
