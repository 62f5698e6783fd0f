"""Hydra search-path plugin: the ``conf/`` folders of the installed packages registered under the entry-point group
``harness.conf`` (the controlled study's points and experiments) and of the modules named in ``HARNESS_PLUGINS``
join the config search path (after the harness' own ``conf/``), so a method or evaluator kept outside the
repository composes like one of its own (``python run.py method=<plugin's>``). Hydra finds this module by its
namespace package ``hydra_plugins``; ``harness.conf_utils`` documents the plugin mechanism."""
from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class HarnessPluginsSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from harness.conf_utils import installed_conf_dirs, plugin_conf_dirs, register_generated_points

        for d in installed_conf_dirs():
            search_path.append(provider="harness-package", path=f"file://{d}")
        for d in plugin_conf_dirs():
            search_path.append(provider="harness-plugin", path=f"file://{d}")
        register_generated_points()  # the points an experiment takes from every method, a plugin's included
