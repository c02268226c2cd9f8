"""The guarded template engine every task prompt and native body is rendered in: the Jinja
sandbox, its filters, and the caps on time, memory and sizes a render runs under.
"""
