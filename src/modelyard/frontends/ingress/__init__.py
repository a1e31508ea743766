"""Several ingress processes in front of one manager: HTTP parsing on every core.

``frames`` is the wire format between an ingress and the manager, ``tunnel`` the
manager's end (the real ASGI app answers each forwarded request), ``child`` the
ingress process, ``supervisor`` starts, restarts and stops the ingress processes.
"""
