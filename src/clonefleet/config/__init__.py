"""The clonefleet configuration file: providers, models, model groups, limits, discovery.

This package finds, reads and validates the YAML config, and holds the embedded defaults used
when no file exists (provider ``sim``, models ``sim-small``/``sim-large``, group ``default``). It
reaches no provider: ``clonefleet.clone`` turns a resolved model into a live client. A project's
own file may ask for what only trust allows (a network provider, an MCP server, ...) only once
its folder is trusted (``clonefleet trust``). See docs/config.md, "Where the file is found" and
"Trusting a project's config".
"""

from __future__ import annotations

from clonefleet.config._files import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from clonefleet.config._files import YAML_MAX_DEPTH as YAML_MAX_DEPTH
from clonefleet.config._files import YAML_MAX_EXPANDED as YAML_MAX_EXPANDED
from clonefleet.config._files import YAML_MAX_INT_BITS as YAML_MAX_INT_BITS
from clonefleet.config._files import YAML_MAX_NODES as YAML_MAX_NODES
from clonefleet.config._files import BoundedSafeLoader as BoundedSafeLoader
from clonefleet.config._files import printable as printable
from clonefleet.config._files import read_regular_file as read_regular_file
from clonefleet.config._files import safe_load_yaml as safe_load_yaml
from clonefleet.config._files import yaml_problem as yaml_problem
from clonefleet.config._load import find_config_path as find_config_path
from clonefleet.config._load import find_config_source as find_config_source
from clonefleet.config._load import load_config as load_config
from clonefleet.config._load import load_config_from as load_config_from
from clonefleet.config._load import user_config as user_config
from clonefleet.config._mcp import MCP_SERVER_NAME as MCP_SERVER_NAME
from clonefleet.config._mcp import McpServerConfig as McpServerConfig
from clonefleet.config._mcp import McpServers as McpServers
from clonefleet.config._mcp import check_mcp_server_name as check_mcp_server_name
from clonefleet.config._permissions import PermissionsConfig as PermissionsConfig
from clonefleet.config._schema import ANTHROPIC_BASE_URL as ANTHROPIC_BASE_URL
from clonefleet.config._schema import ANTHROPIC_KEY_ENV as ANTHROPIC_KEY_ENV
from clonefleet.config._schema import AdmissionConfig as AdmissionConfig
from clonefleet.config._schema import ClusterConfig as ClusterConfig
from clonefleet.config._schema import Config as Config
from clonefleet.config._schema import ConfigSource as ConfigSource
from clonefleet.config._schema import DiscoveryConfig as DiscoveryConfig
from clonefleet.config._schema import DurabilityConfig as DurabilityConfig
from clonefleet.config._schema import LimitsConfig as LimitsConfig
from clonefleet.config._schema import ModelConfig as ModelConfig
from clonefleet.config._schema import Price as Price
from clonefleet.config._schema import PriceConfig as PriceConfig
from clonefleet.config._schema import ProviderConfig as ProviderConfig
from clonefleet.config._schema import SimulatedOptions as SimulatedOptions
from clonefleet.config._schema import price_per_token as price_per_token
from clonefleet.config._schema import provider_route as provider_route
from clonefleet.config._schema import token_cost as token_cost
from clonefleet.config._schema import usage_cost as usage_cost
from clonefleet.config._trust_needs import TrustKind as TrustKind
from clonefleet.config._trust_needs import TrustNeed as TrustNeed
from clonefleet.config._trust_needs import config_needs as config_needs
from clonefleet.config._trust_needs import mcp_change as mcp_change
from clonefleet.config._trust_needs import mcp_need as mcp_need
from clonefleet.config._trust_needs import needs_trust as needs_trust
from clonefleet.config._trust_needs import provider_change as provider_change
from clonefleet.config._trust_needs import trust_command as trust_command
from clonefleet.config._trust_needs import web_change as web_change
from clonefleet.config._trust_records import read_trust_records as read_trust_records
from clonefleet.config._trust_records import revoke_folder as revoke_folder
from clonefleet.config._trust_records import trust_file as trust_file
from clonefleet.config._trust_records import trust_folder as trust_folder
from clonefleet.config._urls import check_base_url as check_base_url
from clonefleet.config._urls import shown_url as shown_url
from clonefleet.config._web import WebConfig as WebConfig
from clonefleet.config._web import WebSearchConfig as WebSearchConfig
from clonefleet.config._web import domain_allowed as domain_allowed

__all__ = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_KEY_ENV",
    "BoundedSafeLoader",
    "ClusterConfig",
    "Config",
    "ConfigSource",
    "DiscoveryConfig",
    "DurabilityConfig",
    "AdmissionConfig",
    "LimitsConfig",
    "MAX_CONFIG_BYTES",
    "MCP_SERVER_NAME",
    "McpServerConfig",
    "McpServers",
    "ModelConfig",
    "PermissionsConfig",
    "PriceConfig",
    "ProviderConfig",
    "SimulatedOptions",
    "TrustKind",
    "TrustNeed",
    "WebConfig",
    "WebSearchConfig",
    "YAML_MAX_DEPTH",
    "YAML_MAX_EXPANDED",
    "YAML_MAX_INT_BITS",
    "YAML_MAX_NODES",
    "check_base_url",
    "check_mcp_server_name",
    "config_needs",
    "domain_allowed",
    "find_config_path",
    "find_config_source",
    "load_config",
    "load_config_from",
    "mcp_change",
    "mcp_need",
    "needs_trust",
    "printable",
    "Price",
    "price_per_token",
    "token_cost",
    "provider_change",
    "provider_route",
    "read_regular_file",
    "read_trust_records",
    "revoke_folder",
    "safe_load_yaml",
    "shown_url",
    "trust_command",
    "trust_file",
    "trust_folder",
    "usage_cost",
    "user_config",
    "web_change",
    "yaml_problem",
]
