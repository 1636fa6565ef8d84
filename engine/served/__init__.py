"""The served face of ``contextful pipeline serve --http``: one HTTP server, routes from each service.

- ``engine.served.face``: :class:`~.face.Route`, :class:`~.face.Exchange`, :func:`~.face.serve_face`.
"""
