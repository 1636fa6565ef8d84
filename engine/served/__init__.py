"""The served face of ``contextful pipeline serve``: HTTP servers, routes from each service.

- ``engine.served.face``: :class:`~.face.Route`, :class:`~.face.Exchange`, :func:`~.face.serve_face`;
- ``engine.served.keys``: bearer keys (reader and writer keys), stored hashed, compared in constant time;
- ``engine.served.awake``: the resume route of awakeables (``POST``/``GET /awake/<token>``), admitting signed credentials;
- ``engine.served.control``: the control routes (``/control/document``, ``/control/draft``, ``/control/apply``), admitting Admin credentials;
- ``engine.served.project``: :func:`~.project.serve_project`, the services of one project on their addresses.
"""
