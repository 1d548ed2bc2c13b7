"""The one exception of the validation layer: a published run that cannot be evaluated, with the reason the report
shows (every mapping step raises it; validate.run_validation records it as the run's skip reason)."""


class Skip(Exception):
    """A run that cannot be evaluated; the message is the reason shown in the report."""
