"""The rlpipe policy server: a Flask app that logs every step to the durable step table."""
