"""The controller: registry, data-access control, jobs as stateful sessions, checkpoints, REST API."""
