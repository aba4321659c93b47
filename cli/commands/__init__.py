"""The `engram` command's modules: each parses its flags, calls a library (`cli.memory`,
`cli.nostr`, `relay`) and prints. The root app is `cli.commands.main.app`."""
