//! Property tests of the device model: the packed encoding round-trips and refuses what does not
//! fit, and the packed fit test always agrees with the plain one (SPEC seed 004); an agent that
//! fits a demand is graded at least as high (the graded ring's promise).

use proptest::prelude::*;
use ringmaster_core::devices::{
    Device, DeviceError, DeviceRequest, DeviceSelection, DeviceState, GpuDemand, LaneLayout,
    PackedLanes, GPUS, GPU_MEM, GPU_MILLI, SHARE_CAPACITY,
};
use ringmaster_core::placement::devices::DeviceBook;
use ringmaster_core::resources::{Resources, MILLI};

fn layout_and_values() -> impl Strategy<Value = (LaneLayout, Vec<u64>)> {
    (1u32..=63, prop::bool::ANY).prop_flat_map(|(bits, wide)| {
        let word = if wide { 128 } else { 64 };
        let lanes = word / bits;
        let max = (1u64 << bits) - 1;
        (
            Just(LaneLayout::new(bits, lanes, word).unwrap()),
            prop::collection::vec(0..=max, 0..=lanes as usize),
        )
    })
}

/// Devices with free amounts: up to 12 devices, memories from a few sizes, two models.
fn device_state() -> impl Strategy<Value = DeviceState> {
    prop::collection::vec(
        (
            prop::sample::select(vec![0u64, 8192, 16384, 32768, 40000]),
            prop::sample::select(vec!["A", "B"]),
            0u32..=SHARE_CAPACITY,
            0u64..=40000,
            prop::bool::ANY,
        ),
        0..=9,
    )
    .prop_map(|spec| {
        let devices: Vec<Device> = spec
            .iter()
            .enumerate()
            .map(|(i, (mem, model, ..))| Device {
                index: i as u32,
                model: model.to_string(),
                memory_mib: *mem,
            })
            .collect();
        // Half the devices fully free (so whole requests often fit), the rest random.
        let share = spec
            .iter()
            .map(|(_, _, s, _, full)| if *full { SHARE_CAPACITY } else { *s })
            .collect();
        let memory = spec
            .iter()
            .map(|(mem, _, _, m, full)| if *full { *mem } else { (*m).min(*mem) })
            .collect();
        DeviceState::with_free(devices, share, memory).unwrap()
    })
}

fn request() -> impl Strategy<Value = DeviceRequest> {
    let models = prop::sample::select(vec![vec![], vec!["A".to_string()], vec!["B".to_string()]]);
    let demand = prop_oneof![
        (1u32..=4).prop_map(|count| GpuDemand::Whole { count }),
        (
            0u32..=SHARE_CAPACITY,
            prop::sample::select(vec![0u64, 1, 4096, 16384, 30000])
        )
            .prop_filter("a slice asks for something", |(s, m)| *s > 0 || *m > 0)
            .prop_map(|(share, memory_mib)| GpuDemand::Slice { share, memory_mib }),
    ];
    (demand, models).prop_map(|(demand, models)| DeviceRequest { demand, models })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn encode_decode_round_trips((layout, values) in layout_and_values()) {
        let packed = PackedLanes::encode(layout, &values).unwrap();
        let mut expected = values.clone();
        expected.resize(layout.lanes() as usize, 0);
        prop_assert_eq!(packed.decode(), expected.clone());
        let sum = values.iter().enumerate()
            .fold(0u128, |k, (i, &v)| k | (u128::from(v) << (i as u32 * layout.bits())));
        prop_assert_eq!(packed.word(), sum);
        for need in [0u64, 1, expected.first().copied().unwrap_or(0), (1u64 << layout.bits()) - 1] {
            let count = expected.iter().filter(|&&v| v >= need).count() as u32;
            prop_assert_eq!(packed.count_at_least(need), count);
            let mask = expected.iter().enumerate()
                .filter(|(_, &v)| v >= need)
                .fold(0u128, |m, (i, _)| m | 1 << i);
            prop_assert_eq!(packed.lanes_at_least(need), mask);
        }
    }

    #[test]
    fn values_needing_more_bits_are_refused(bits in 1u32..=62, lane in 0usize..2, extra in 0u64..1000) {
        let layout = LaneLayout::new(bits, 2, 128).unwrap();
        let mut values = vec![0u64; 2];
        values[lane] = (1u64 << bits) + extra;
        prop_assert_eq!(
            PackedLanes::encode(layout, &values).unwrap_err(),
            DeviceError::ValueTooWide { lane, value: values[lane], bits }
        );
    }

    #[test]
    fn layouts_wider_than_the_word_are_refused(bits in 1u32..=63, lanes in 0u32..200, wide in prop::bool::ANY) {
        let word = if wide { 128 } else { 64 };
        let fits = u64::from(bits) * u64::from(lanes) <= u64::from(word);
        prop_assert_eq!(LaneLayout::new(bits, lanes, word).is_ok(), fits);
    }

    #[test]
    fn packed_fit_equals_plain_fit(state in device_state(), request in request()) {
        match state.packed() {
            Ok(packed) => prop_assert_eq!(packed.fits(&request), state.fits(&request)),
            // Refused only when the memory lanes really do not fit one 128-bit word.
            Err(DeviceError::Layout(_)) => {
                let max = state.devices().iter().map(|d| d.memory_mib).max().unwrap_or(0);
                let bits = u64::from(64 - max.leading_zeros()).max(1);
                prop_assert!(bits * state.devices().len() as u64 > 128);
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn selection_fits_exactly_when_the_request_fits(state in device_state(), request in request(), pack in prop::bool::ANY) {
        let policy = if pack { DeviceSelection::MostUsedThatFits } else { DeviceSelection::LeastUsed };
        let binding = state.select(&request, policy);
        prop_assert_eq!(binding.is_some(), state.fits(&request));
        if let Some(binding) = binding {
            prop_assert!(state.check_binding(&request, &binding).is_ok());
            let mut after = state.clone();
            after.bind(&binding).unwrap();
            after.release(&binding);
            prop_assert_eq!(after, state);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Identical requests: each device takes as many as fit, whatever the order, so a framework
    /// counting copies agrees with the master binding them one by one with any policy.
    #[test]
    fn copies_do_not_depend_on_the_policy(state in device_state(), request in request()) {
        let per_device: u32 = match request.demand {
            GpuDemand::Whole { count } => {
                let free = (0..state.devices().len())
                    .filter(|&i| request.models.is_empty() || request.models.contains(&state.devices()[i].model))
                    .filter(|&i| state.free_share()[i] == SHARE_CAPACITY && state.free_memory()[i] == state.devices()[i].memory_mib)
                    .count() as u32;
                free / count
            }
            GpuDemand::Slice { share, memory_mib } => (0..state.devices().len())
                .filter(|&i| request.models.is_empty() || request.models.contains(&state.devices()[i].model))
                .map(|i| {
                    let by_share = state.free_share()[i].checked_div(share).map_or(u64::MAX, u64::from);
                    let by_mem = state.free_memory()[i].checked_div(memory_mib).unwrap_or(u64::MAX);
                    by_share.min(by_mem)
                })
                .fold(0u64, u64::saturating_add)
                .min(u64::from(u32::MAX)) as u32,
        };
        let limit = 5000;
        prop_assert_eq!(state.copies_of(&request, limit), per_device.min(limit));
        for policy in [DeviceSelection::LeastUsed, DeviceSelection::MostUsedThatFits] {
            let mut s = state.clone();
            let mut n = 0;
            while let Some(b) = s.select(&request, policy) {
                s.bind(&b).unwrap();
                n += 1;
                if n >= limit { break; }
            }
            prop_assert_eq!(n, per_device.min(limit));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// After any bindings, an agent whose devices hold a demand is graded at least as high as
    /// the demand: the promise the graded `gpu_milli` ring's walk relies on.
    #[test]
    fn an_agent_that_fits_a_demand_is_graded_as_high(
        state in device_state(),
        bound in prop::collection::vec(request(), 0..8),
        asked in request(),
    ) {
        let mut book = DeviceBook::new();
        prop_assume!(!state.devices().is_empty());
        book.set_agent(0, state.devices().to_vec()).unwrap();
        for request in &bound {
            // Chooses devices and takes them, or nothing when the request does not fit.
            let _ = book.bind(0, request, DeviceSelection::LeastUsed);
        }
        let scalars = match asked.demand {
            GpuDemand::Whole { count } => vec![(GPUS, u64::from(count) * MILLI)],
            GpuDemand::Slice { share, memory_mib } => {
                vec![(GPU_MILLI, u64::from(share) * MILLI), (GPU_MEM, memory_mib * MILLI)]
            }
        };
        let demand =
            Resources::from_milli(scalars.into_iter().filter(|&(_, m)| m > 0)).unwrap();
        if book.fits(0, &demand) {
            prop_assert!(
                book.grade(0) >= DeviceBook::demand_grade(&demand),
                "{} graded {} on an agent graded {}: {:?}",
                demand, DeviceBook::demand_grade(&demand), book.grade(0), book.state(0)
            );
        }
    }
}
