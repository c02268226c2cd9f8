from clonefleet.cli.program import entry

entry()
