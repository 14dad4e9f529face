"""Test and benchmark support: throwaway Redis servers, `serve run` launchers. Never imported by the product."""
