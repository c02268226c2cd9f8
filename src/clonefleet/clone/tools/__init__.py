"""The tools a clone's model can call: work tools, job-control tools, and the control tools
every clone has.
"""
