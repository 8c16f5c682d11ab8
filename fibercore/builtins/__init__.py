"""Built-in plugins: the default transport and serializer, replaceable like any other."""
