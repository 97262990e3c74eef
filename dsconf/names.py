"""The names dsconf gives itself in Hydra: its base config, and the config source that serves its configs."""

BASE_CONFIG_NAME = "dsconf"  # the config a primary config lists (``defaults: [dsconf, _self_]``)
SCHEME = "dsconf"  # dsconf's config source: ``dsconf://`` on a dsconf app's search path
PROVIDER = "dsconf"  # the provider Hydra shows for dsconf's search-path entry and configs
SEARCH_PATH = f"{SCHEME}://"
LAZY = "until-composed"  # ``dsconf://until-composed``: its groups only once the app has composed ``dsconf``
