"""The dashboard: a page shipped in the package, and the read-only feed that fills it.

:mod:`.feed` keeps what a page needs to draw the cluster at once (pure, synchronous);
:mod:`.serving` subscribes to the bus as the ``dashboard`` identity and streams that feed to
browsers as server-sent events, next to the page itself (``static/``: plain HTML, CSS and
JavaScript written for this project, nothing fetched from elsewhere at run time).
"""
