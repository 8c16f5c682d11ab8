"""The built-in transport's rooms (the plugin itself: :mod:`fibercore.builtins.tcp_transport`).

- :mod:`.connection`: one connection's records, read and written; a Pipe end's :class:`Line`;
- :mod:`.spinning`: when a waiting read may poll first;
- :mod:`.options`: keepalive, no Nagle, send buffers;
- :mod:`.addresses`: ``tcp://host:port[/machine]``;
- :mod:`.reactor`: the one thread per process that accepts and authenticates;
- :mod:`.admission`: a listener's reactor side (limits, handshakes, drops);
- :mod:`.listener`: a listener's reading and writing side, on its callers' threads;
- :mod:`.dialer`: a dialling endpoint, and how a connection is made;
- :mod:`.local`: the same-machine Unix socket, its name and its user check;
- :mod:`.tls`: certificates both ways.
"""
