"""The web view: its HTTP answers and login, its document (from a server's status),
its page. :mod:`lowtide.service.net` serves it."""
