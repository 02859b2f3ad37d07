"""Output shapes of the memory endpoints, for the OpenAPI schema: the views build these bodies from the
selectors' dicts (memory/selectors.py, memory/archival.py, memory/enduser.py), and `make schema-check`
holds every response to them."""

from rest_framework import serializers

from memory.models import Actor, ArchivalMemory, StateEvent
from tenants.api import DegradationSerializer

# --- core memory ------------------------------------------------------------------------------------------


class CoreMemoryBlockOutputSerializer(serializers.Serializer):
    label = serializers.CharField()  # type: ignore[assignment]  # the field is named label; DRF's stubs type Field.label
    value = serializers.CharField()
    char_limit = serializers.IntegerField()
    chars = serializers.IntegerField()
    version = serializers.IntegerField(
        help_text="Also the ETag; send it back in If-Match to change the block."
    )
    updated_by = serializers.CharField()
    updated_at = serializers.DateTimeField()


class CoreMemoryBlockListOutputSerializer(serializers.Serializer):
    blocks = CoreMemoryBlockOutputSerializer(many=True)


class MemoryOperationOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    op = serializers.CharField()
    target = serializers.CharField()
    old_value = serializers.CharField(allow_null=True)
    new_value = serializers.CharField(allow_null=True)
    trigger = serializers.CharField()
    actor = serializers.ChoiceField(choices=Actor.values)
    actor_name = serializers.CharField()
    conversation_id = serializers.UUIDField(allow_null=True)
    reverted_by = serializers.IntegerField(allow_null=True)
    details = serializers.DictField()
    created_at = serializers.DateTimeField()


class MemoryOperationListOutputSerializer(serializers.Serializer):
    operations = MemoryOperationOutputSerializer(many=True)


# --- task state -------------------------------------------------------------------------------------------


class StateEventOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    epoch = serializers.IntegerField(
        help_text="The epoch this event produced (the one it was appended at + 1)."
    )
    event_type = serializers.ChoiceField(choices=StateEvent.Type.values)
    payload = serializers.DictField()
    request_id = serializers.CharField()
    created_at = serializers.DateTimeField()


class TaskStateOutputSerializer(serializers.Serializer):
    epoch = serializers.IntegerField(help_text="Send it as expected_epoch with the next event.")
    base_epoch = serializers.IntegerField(help_text="The last event folded into `base`.")
    state = serializers.DictField(help_text="The overlay: `base` with the pending events applied.")
    base = serializers.DictField()
    pending_events = StateEventOutputSerializer(many=True)


class StateEventCreateOutputSerializer(TaskStateOutputSerializer):
    event = StateEventOutputSerializer()


class StateFoldOutputSerializer(TaskStateOutputSerializer):
    folded = serializers.IntegerField(help_text="How many events were folded into the base.")


# --- archival memory --------------------------------------------------------------------------------------


class ArchivalMemoryOutputSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    content = serializers.CharField()
    kind = serializers.ChoiceField(choices=ArchivalMemory.Kind.choices)
    subject = serializers.CharField(allow_blank=True)
    importance = serializers.FloatField()
    mentions = serializers.IntegerField()
    conversation_id = serializers.UUIDField(allow_null=True)
    source_message_ids = serializers.ListField(child=serializers.CharField())
    embedding_model = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    invalidated_at = serializers.DateTimeField(allow_null=True)
    invalidated_by = serializers.UUIDField(allow_null=True)


class ArchivalMemoryListOutputSerializer(serializers.Serializer):
    memories = ArchivalMemoryOutputSerializer(many=True)


class ArchivalInsertOutputSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=["inserted", "merged"])
    memory = ArchivalMemoryOutputSerializer()
    invalidated = serializers.ListField(child=serializers.UUIDField())
    degradations = DegradationSerializer(many=True)


class ArchivalSearchHitSerializer(serializers.Serializer):
    memory = ArchivalMemoryOutputSerializer()
    score = serializers.FloatField()
    lexical_rank = serializers.IntegerField(allow_null=True)
    vector_rank = serializers.IntegerField(allow_null=True)


class ArchivalSearchOutputSerializer(serializers.Serializer):
    mode = serializers.CharField()
    results = ArchivalSearchHitSerializer(many=True)
    degradations = DegradationSerializer(many=True)


# --- the end user's data ----------------------------------------------------------------------------------


class EndUserDeletedCountsSerializer(serializers.Serializer):
    conversations = serializers.IntegerField()
    core_memory_blocks = serializers.IntegerField()
    archival_memories = serializers.IntegerField()
    memory_operations = serializers.IntegerField()


class EndUserDeleteOutputSerializer(serializers.Serializer):
    deleted = EndUserDeletedCountsSerializer()


class CoreMemoryVersionExportSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    value = serializers.CharField()
    updated_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class CoreMemoryBlockExportSerializer(CoreMemoryBlockOutputSerializer):
    history = CoreMemoryVersionExportSerializer(many=True)


class StateEventExportSerializer(serializers.Serializer):
    epoch = serializers.IntegerField()
    event_type = serializers.ChoiceField(choices=StateEvent.Type.values)
    payload = serializers.DictField()
    request_id = serializers.CharField()


class TaskStateExportSerializer(serializers.Serializer):
    epoch = serializers.IntegerField()
    base_epoch = serializers.IntegerField()
    base = serializers.DictField()
    events = StateEventExportSerializer(many=True)


class MessageExportSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    seq = serializers.IntegerField()
    role = serializers.CharField()
    name = serializers.CharField(allow_blank=True, help_text="The speaker, when the client named one.")
    kind = serializers.CharField()
    content = serializers.CharField(allow_blank=True)
    parts = serializers.ListField(child=serializers.DictField())
    created_at = serializers.DateTimeField()


class ConversationExportSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField(allow_blank=True)
    model = serializers.CharField()
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()
    archived_at = serializers.DateTimeField(allow_null=True)
    task_state = TaskStateExportSerializer()
    messages = MessageExportSerializer(many=True)


class EndUserExportOutputSerializer(serializers.Serializer):
    external_id = serializers.CharField()
    core_memory = CoreMemoryBlockExportSerializer(many=True)
    archival_memories = ArchivalMemoryOutputSerializer(many=True)
    memory_operations = MemoryOperationOutputSerializer(many=True)
    conversations = ConversationExportSerializer(many=True)


class MemoryAgentProgressOutputSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(
        help_text="False for a conversation without an end user: no memory agent."
    )
    read_to_seq = serializers.IntegerField(help_text="The memory agent has read the messages up to this seq.")
    pending = serializers.BooleanField(help_text="A completed exchange after read_to_seq is still unread.")
