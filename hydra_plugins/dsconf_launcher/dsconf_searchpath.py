"""dsconf's configs on the search path of dsconf apps alone (``dsconf.config_source`` says which apps are).

Hydra calls ``manipulate_search_path`` for every app before it composes; the work is in
``dsconf.launch.command_line.on_search_path``.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

# found by Hydra's plugin scan here: the ``dsconf://`` config source
from dsconf.config_source import DsconfConfigSource  # noqa: F401


class DsconfSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from dsconf.launch.command_line import on_search_path

        on_search_path(search_path)
