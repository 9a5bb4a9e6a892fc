"""The inference engines: their token APIs (api.py), the proxy's HTTP client to them (client.py), the engines a
proxy is given (backends.py), and the live replicas with placement, health and failover (replicas.py)."""
