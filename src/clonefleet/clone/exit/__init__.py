"""The exit judge: a clone's ``exit_tool`` payload checked against its schema, bounded in size and
time, and turned into a status.
"""
