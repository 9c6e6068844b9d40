"""The graph: drivers for FalkorDB and Neo4j, the ontology graphiti extracts with, which fact ended which, and a group's graph as JSONL (export/import)."""
