"""Layer 4: codecs, transports and discovery.

Importing the in-memory transport pulls in neither grpc nor hivemind.
"""
