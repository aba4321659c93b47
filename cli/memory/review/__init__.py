"""`engram review`: the owner's local web page over an agent's memory (issue 40).

A library under `cli.memory` like the rest of the agent-memory client; `cli/commands/review.py` is
its typer command. `guard` is the door (token or launch cookie, Host, Origin, CSRF,
headers), `snapshot` reads what the pages show (one read per page), `listing` selects the
list's rows, `timeline` draws a memory's history, `pages` cuts long views into pages,
`actions` are the owner's changes, `visits` remembers the last visit, `graph` lays out
core's picture, `diffs` the differences, `app` the routes and `server` runs it on loopback.
"""
